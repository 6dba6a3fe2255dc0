-- snapshots: one row per scrape of one engine, or of one router's view of one worker
-- (source = 'router'; grain: replica, dp_rank, scraped_at; target disambiguates two scrape
-- URLs of one replica). prefix_cache_hit_rate is windowed: the increase of vLLM's hits counter
-- over the increase of its queries counter since the previous successful scrape of the same
-- target, replica and rank; null on the first scrape, when no query came in, or when a counter
-- went down (engine restart).
with

stg_snapshots_source as (

    select * from stg_snapshots

),

snapshots_with_previous as (

    select
        *,
        lag(prefix_cache_queries) over (
            partition by target, replica, dp_rank, ok order by scraped_ns
        ) as previous_queries,
        lag(prefix_cache_hits) over (
            partition by target, replica, dp_rank, ok order by scraped_ns
        ) as previous_hits
    from stg_snapshots_source

),

final as (

    select
        replica,
        dp_rank,
        target,
        to_timestamp(scraped_ns / 1e9) as scraped_at,
        scraped_ns,
        scrape_ms,
        ok,
        error,
        running,
        waiting,
        kv_usage,
        case
            when ok
                and prefix_cache_queries - previous_queries > 0
                and prefix_cache_hits - previous_hits >= 0
                then (prefix_cache_hits - previous_hits)
                / (prefix_cache_queries - previous_queries)
        end as prefix_cache_hit_rate,
        cache_hit_rate,
        model_name,
        source,
        router_in_flight,
        router_dispatched,
        router_healthy
    from snapshots_with_previous

)

select * from final
