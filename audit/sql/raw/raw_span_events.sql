-- raw_span_events: one row per span event (grain: trace_id, span_id, event_index).
-- No primary key: an event is stored with its span, so a retried export, whose spans
-- raw_spans already holds, adds none (audit/_store.py, Store.append); the index on ten million
-- keys cost ingest a third of its speed. Stores created before keep theirs.
-- Candidate facts of routeaudit.decision spans and SMG's "Sending request" url arrive here;
-- the c_* / e_* columns are typed copies of TYPED_EVENT_ATTRIBUTES in audit/semconv.py.
create table if not exists raw_span_events (
    trace_id varchar not null,
    span_id varchar not null,
    event_index bigint not null,
    name varchar not null,
    time_ns bigint not null,            -- Unix ns, emitting host's clock
    attributes varchar,
    c_replica varchar,
    c_eligible boolean,
    c_excluded_reason varchar,
    c_chosen boolean,
    c_waiting bigint,
    c_running bigint,
    c_kv_usage double,
    c_remaining_tokens bigint,
    c_telemetry_ts_ns bigint,
    c_telemetry_age_ms double,
    c_pending bigint,
    c_predicted_cached_tokens bigint,
    c_est_queue_ms double,
    c_est_prefill_ms double,
    c_score double,
    e_url varchar,
    e_worker_url varchar,
    e_worker varchar,
    c_dp_rank bigint
);
