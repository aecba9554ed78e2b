"""The pure state rules: breaker transitions and token-bucket arithmetic.

Functions of a record and a time, with no store, clock or policy behind them, so every
backend (the memory store under a lock, SQLite in a transaction, Redis in Lua) makes the
same decisions. The bottom layer of the core: it imports nothing of loop-governor.
"""
