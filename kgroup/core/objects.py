"""The JSON object type of Kubernetes objects as the API server sends them: ``Obj``, a
decoded object (a Lease, a Pod, a ConsumerGroup, a watch event's object) before any model
reads it. The one definition every layer imports: it imports nothing of kgroup."""

from typing import Any

Obj = dict[str, Any]

__all__ = ["Obj"]
