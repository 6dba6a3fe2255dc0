-- slo_targets: exactly one row, with both targets.
select count(*) as row_count
from slo_targets
having count(*) <> 1 or count(ttft_slo_ms) <> 1 or count(tpot_slo_ms) <> 1
