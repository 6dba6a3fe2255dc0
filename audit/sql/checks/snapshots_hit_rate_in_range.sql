-- snapshots: windowed hit rates are fractions.
select *
from snapshots
where prefix_cache_hit_rate not between 0 and 1
    or cache_hit_rate not between 0 and 1
