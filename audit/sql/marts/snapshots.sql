-- PLACEHOLDER: the real snapshots relation is being written; same columns as docs/schema.md.
with final as (
    select
        cast(null as varchar) as replica,
        cast(null as bigint) as dp_rank,
        cast(null as timestamptz) as scraped_at,
        cast(null as boolean) as ok,
        cast(null as varchar) as error,
        cast(null as double) as running,
        cast(null as double) as waiting,
        cast(null as double) as kv_usage,
        cast(null as double) as prefix_cache_hit_rate,
        cast(null as double) as cache_hit_rate
    where false
)

select * from final
