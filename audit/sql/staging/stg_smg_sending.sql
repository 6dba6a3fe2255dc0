-- stg_smg_sending: one row per SMG "Sending request" span event (grain: trace_id, span_id,
-- event_index): the worker SMG forwarded the request to, as the event's `url` attribute.
-- Normalised like stg_spans. No joins, no aggregation.
with

raw_span_events_source as (

    select * from raw_span_events

),

sending_events as (

    select
        trace_id,
        span_id as router_span_id,
        event_index,
        time_ns as sent_ns,
        coalesce(e_url, e_worker_url, e_worker)
            as raw_url
    from raw_span_events_source
    where name = 'Sending request'

),

final as (

    select
        trace_id,
        router_span_id,
        event_index,
        sent_ns,
        raw_url,
        case
            when nullif(trim(raw_url), '') is null then null
            when regexp_matches(trim(raw_url), '^[A-Za-z][A-Za-z0-9+.-]*://')
                or regexp_matches(
                    trim(raw_url), '^(\[[^\]]+\]|[^/:\s]+):[0-9]+(/.*)?$'
                )
                then regexp_replace(
                    regexp_extract(
                        lower(trim(raw_url)),
                        '^(?:[a-z][a-z0-9+.-]*://)?(?:[^@/]*@)?'
                        || '((?:\[[^\]]+\]|[^/:?#]+)(?::[0-9]+)?)',
                        1
                    ),
                    '^(localhost|0\.0\.0\.0|\[::1\]|\[::\])(:|$)',
                    '127.0.0.1\2'
                )
            else trim(raw_url)
        end as replica
    from sending_events

)

select * from final
