"""Retention policies: which committed epochs a checkpoint manager keeps.

Pass one policy, or a list of them (their union), as
``CheckpointManager(..., keep=...)``. ``keep=None`` keeps every epoch.
Whatever the policies say, the newest committed epoch and any epoch being
written are never deleted, and an epoch is deleted only after a newer one
has committed.

Example:
    >>> import jaxjob
    >>> policy = [jaxjob.keep.Last(1), jaxjob.keep.Every(3)]
    >>> sorted(jaxjob.keep.kept(policy, range(9)))
    [0, 3, 6, 8]
"""

from jaxjob._src.manager.retention.keep import Best as Best
from jaxjob._src.manager.retention.keep import Every as Every
from jaxjob._src.manager.retention.keep import Last as Last
from jaxjob._src.manager.retention.keep import Policy as Policy
from jaxjob._src.manager.retention.keep import kept as kept
from jaxjob._src.manager.retention.keep import metric_names as metric_names
from jaxjob._src.manager.retention.keep import normalize as normalize

__all__ = ["Best", "Every", "Last", "Policy", "kept", "metric_names", "normalize"]
