"""pydantic-ai adapter for loop-governor.

Thin by design: governance (classification, retries, breakers, budgets, the loop guards,
known-bad calls) lives in [`loop_governor`][loop_governor]; this package plugs it into
pydantic-ai's extension point, the capability:

    import loop_governor as lg
    from pydantic_ai import Agent
    from pydantic_ai_governor import GovernorCapability

    agent = Agent(model, tools=[...], capabilities=[GovernorCapability(lg.Governor())])
"""

from pydantic_ai_governor.capability import GovernorCapability

__all__ = ["GovernorCapability"]
