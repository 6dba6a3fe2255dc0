-- stg_snapshots: one row per scrape of one engine, or of one router's view of one worker
-- (grain: target, replica, dp_rank, scraped_ns). raw_snapshots has no key (the collector
-- writes it), so an exact repeat of a scrape is kept once. The replica id is normalised like
-- stg_spans; rows written before `source` existed are the engines' own. No joins, no
-- aggregation.
with

raw_snapshots_source as (

    select * from raw_snapshots

),

snapshots_deduplicated as (

    select *
    from raw_snapshots_source
    qualify row_number() over (
        partition by target, replica, dp_rank, scraped_ns
        order by ok desc, error asc nulls first
    ) = 1

),

final as (

    select
        target,
        case
            when nullif(trim(replica), '') is null then null
            when regexp_matches(trim(replica), '^[A-Za-z][A-Za-z0-9+.-]*://')
                or regexp_matches(
                    trim(replica), '^(\[[^\]]+\]|[^/:\s]+):[0-9]+(/.*)?$'
                )
                then regexp_replace(
                    regexp_extract(
                        lower(trim(replica)),
                        '^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/]*@)?'
                        || '((?:\[[^\]]+\]|[^/:?#]+)(?::[0-9]+)?)',
                        1
                    ),
                    '^(localhost|0\.0\.0\.0|\[::1\]|\[::\])(:|$)',
                    '127.0.0.1\2'
                )
            else trim(replica)
        end
        || case when dp_rank > 0 then '#' || cast(dp_rank as varchar) else '' end
            as replica,
        dp_rank,
        scraped_ns,
        scrape_ms,
        ok,
        error,
        running,
        waiting,
        kv_usage,
        prefix_cache_queries,
        prefix_cache_hits,
        cache_hit_rate,
        model_name,
        coalesce(source, 'replica') as source,
        router_in_flight,
        router_dispatched,
        router_healthy
    from snapshots_deduplicated

)

select * from final
