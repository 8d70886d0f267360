"""The relay lane: intents and timers committed by turns are claimed and delivered as commands.

``intents`` claims due outbox rows under a lease, delivers each as an internal command with the
intent id as command id (the receiver's receipt makes a redelivery a replay), and settles the row
with a statement guarded by its claim token.
"""
