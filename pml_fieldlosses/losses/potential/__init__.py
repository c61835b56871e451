"""The machinery of the potential-field losses (BasePotentialLoss): their energy, the search for
the pairs off the potentials' plateaus, and the proxies' neighbour list. Import from the modules."""
