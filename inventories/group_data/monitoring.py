# The monitoring host has no GPU: no GPU stages (deploys/monitoring.py configures it).
import os

gpufleet_stages = []

# Prometheus: how often it scrapes the exporters and evaluates the rules; an alert's `for` can be overridden.
gpufleet_monitoring_scrape_interval = "15s"
gpufleet_monitoring_evaluation_interval = "15s"
gpufleet_monitoring_alert_for = {"GpuOverheating": "2m"}
gpufleet_monitoring_verify_max_age = "8d"  # VerifyStale: schedule `gpufleet verify` more often than this

# Alertmanager: the first receiver is the default route; routes send matching alerts elsewhere.
gpufleet_monitoring_receivers = [
    {"name": "ops", "type": "webhook", "url": "http://alerts.cluster.example:9095/gpufleet"},
    # {"name": "mail", "type": "email", "to": "gpu-ops@example.com", "from": "alertmanager@example.com",
    #  "smarthost": "smtp.example.com:587"},
    # {"name": "chat", "type": "slack", "api_url": os.environ.get("GPUFLEET_SLACK_WEBHOOK"), "channel": "#gpu-ops"},
]
gpufleet_monitoring_routes = [
    # {"receiver": "chat", "matchers": {"severity": "critical"}},
]

# Grafana: the admin password comes from the environment, never from a file in the repository; the deploy refuses
# to install Grafana without one (or with a default one). Set gpufleet_monitoring_grafana = False to skip Grafana.
gpufleet_monitoring_grafana = True
gpufleet_monitoring_grafana_admin_password = os.environ.get("GPUFLEET_GRAFANA_ADMIN_PASSWORD")
