-- requests: at least one side was seen; router_side_missing agrees with has_* flags.
select *
from requests
where not (has_client or has_router or has_replica)
    or router_side_missing <> (has_client and has_replica and not has_router)
