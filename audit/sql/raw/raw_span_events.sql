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
    c_replica VARCHAR,
    c_eligible BOOLEAN,
    c_excluded_reason VARCHAR,
    c_chosen BOOLEAN,
    c_waiting BIGINT,
    c_running BIGINT,
    c_kv_usage DOUBLE,
    c_remaining_tokens BIGINT,
    c_telemetry_ts_ns BIGINT,
    c_telemetry_age_ms DOUBLE,
    c_pending BIGINT,
    c_predicted_cached_tokens BIGINT,
    c_est_queue_ms DOUBLE,
    c_est_prefill_ms DOUBLE,
    c_score DOUBLE,
    e_url VARCHAR,
    e_worker_url VARCHAR,
    e_worker VARCHAR,
    c_dp_rank BIGINT
);
