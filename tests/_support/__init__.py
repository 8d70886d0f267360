"""Helpers shared by the test suites: one polling helper, one policy override."""

from tests._support.policy import policy_override
from tests._support.polling import until

__all__ = ["policy_override", "until"]
