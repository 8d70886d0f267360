"""The subscriptions lane: delivers source events to subscribers (the subscriptions spec).

``lane`` claims feeds with work (one row per source and subscription, written by the source's
commit flight) and runs one round per claimed feed; ``rounds`` reads the source's events after
the feed's ``done``, finds each event's subscribers (routed: ``route(event, source)``;
dynamic: the feed's follows) and delivers them in cursor order, each as an internal command on
the subscriber whose turn records its applied cursor (S1).
"""

from akter._engine.subscriptions.lane import SubscriptionLane

__all__ = ["SubscriptionLane"]
