"""Router instrumentation: record routing decisions as ``routeaudit.decision`` spans.

See ``docs/instrument-your-router.md``. Depends on ``opentelemetry-api`` only.
"""

from ._direct_spans import DirectSpans
from ._inbound import Inbound
from ._middleware import RouterMiddleware
from ._recorder import Decision, DecisionRecorder, Forward
from ._records import Candidate, DecisionRecord, candidates_of

__all__ = [
    "Candidate", "Decision", "DecisionRecord", "DecisionRecorder", "DirectSpans", "Forward", "Inbound",
    "RouterMiddleware", "candidates_of",
]
