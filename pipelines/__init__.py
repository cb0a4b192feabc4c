"""DataFrame to DataFrame transformations: flow state and its building blocks."""
