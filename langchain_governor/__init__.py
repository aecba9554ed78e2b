"""LangChain adapter for loop-governor (see the langchain adapter issue)."""
