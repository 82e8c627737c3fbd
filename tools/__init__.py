"""Project tooling that is not part of the product: the mutation gate, the generated docs."""
