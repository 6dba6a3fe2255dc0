-- int_request_spans: one row per side span linked to a request (grain: trace_id, span_id): its
-- request_key and start (on the span's own clock). The keys of int_spans_clock_corrected
-- without the rest of its columns, small enough to keep for closed partitions where the spans
-- themselves are not: a refresh finds the stored requests a late span joins by its trace and
-- the traces of the requests it recomputes, and a request's drill-down its spans
-- (docs/architecture.md, "Closed partitions").
with

spans as (
    select * from int_spans_clock_corrected
),

final as (
    select
        spans.request_key,
        spans.trace_id,
        spans.span_id,
        spans.start_ns
    from spans
    where spans.request_key is not null
)

select * from final
