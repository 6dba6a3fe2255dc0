-- int_attr_decisions_resolved: decision_key (a hash of the grain) is unique, so the candidate
-- relations that join on it never join one decision's candidates to another's.
select cast(decision_key as varchar) as decision_key, count(*) as row_count
from int_attr_decisions_resolved
group by decision_key
having count(*) > 1
