"""Is speculative output the target's? validate (greedy and sampled), the token comparison, teacher
forcing, the distribution test, the PyTorch reference runs, and doctor."""
