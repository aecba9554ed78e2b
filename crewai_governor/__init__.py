"""CrewAI adapter for loop-governor (see the crewai adapter issue)."""
