-- requests: health and model-list probes never become requests.
select *
from requests
where endpoint in ('/health', '/v1/models', '/metrics', '/health_generate')
