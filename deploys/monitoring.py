"""The monitoring host(s) of the inventory (group ``monitoring``): Prometheus with scrape targets generated from
the inventory, gpufleet's alert rules, Alertmanager, Grafana's provisioning:

    pyinfra INVENTORY deploys/monitoring.py

Every host's settings are validated before any host is changed. See README.md (Monitoring).
"""

from gpufleet.deploys.monitoring import monitoring

monitoring()
