"""Monitoring: alert and recording rules rendered from data, scrape targets from the inventory, exporters.

The rules' thresholds are the verify thresholds (``gpufleet/verify/thresholds.json``) and the catalog, so verify
and monitoring judge a GPU by the same numbers.
"""
