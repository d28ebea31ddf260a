"""The monitoring host(s) of the inventory (group ``monitoring``): Prometheus with scrape targets generated from
the inventory, gpufleet's alert rules, Alertmanager, Grafana's provisioning:

    pyinfra INVENTORY deploys/monitoring.py

Every host's settings are validated before any host is changed. See docs/monitoring.md.
"""

from gpufleet.deploys.monitoring import monitoring

monitoring()
