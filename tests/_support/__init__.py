"""Helpers shared by the test suites: one polling helper, a mailbox barrier, a policy override."""

from tests._support.barriers import until_pending
from tests._support.policy import policy_override
from tests._support.polling import until

__all__ = ["policy_override", "until", "until_pending"]
