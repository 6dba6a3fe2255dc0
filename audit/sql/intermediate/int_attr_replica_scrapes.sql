-- int_attr_replica_scrapes: one row per (replica, scraped_at) of a successful engine scrape:
-- one scrape holds one row per dp rank, so the ranks of a replica at one instant are added
-- (waiting, running) or maxed (KV usage). What the router would have seen without recording
-- candidates (int_attr_candidates_resolved) and the KV pressure near a decision
-- (int_attr_candidates_estimated).
with

all_snapshots as (
    select * from snapshots
),

final as (
    select
        replica,
        scraped_at,
        sum(waiting) as waiting,
        sum(running) as running,
        max(kv_usage) as kv_usage
    from all_snapshots
    -- the engines' own scrapes: a router's view of a worker is not the engine's state
    where coalesce(ok, true) and source = 'replica'
    group by all
)

select * from final
