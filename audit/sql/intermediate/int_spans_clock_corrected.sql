-- int_spans_clock_corrected: one row per side span (grain: trace_id, span_id) with every
-- staged column, its request (request_key, link_method) and its times moved onto the reference
-- clock (corrected_*_ns = observed - offset of the span's clock domain in the partition of the
-- span's start on its own clock, int_clock_offsets).
with

stg_spans_source as not materialized (

    select * from stg_spans

),

int_requests_linked_source as not materialized (

    select * from int_requests_linked

),

int_clock_offsets_source as not materialized (

    select * from int_clock_offsets

),

stg_partitioning_source as not materialized (

    select * from stg_partitioning

),

final as (

    select
        spans.*,
        linked.request_key,
        linked.request_trace_id,
        linked.request_anchor_span_id,
        linked.link_method,
        coalesce(offsets.offset_ns, 0) as clock_offset_ns,
        coalesce(offsets.clock_status, 'unbounded') as clock_status,
        spans.start_ns - coalesce(offsets.offset_ns, 0) as corrected_start_ns,
        spans.end_ns - coalesce(offsets.offset_ns, 0) as corrected_end_ns,
        spans.decided_ns - coalesce(offsets.offset_ns, 0)
            as corrected_decided_ns
    from int_requests_linked_source as linked
    inner join stg_spans_source as spans
        on spans.trace_id = linked.trace_id
        and spans.span_id = linked.span_id
    cross join stg_partitioning_source as partitioning
    left join int_clock_offsets_source as offsets
        on offsets.part = spans.start_ns // partitioning.partition_ns
        and offsets.clock_domain = spans.clock_domain

)

select * from final
