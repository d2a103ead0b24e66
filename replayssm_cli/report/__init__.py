"""Results and what is shown of them: the results file, provenance labels, compare, the roofline and its figure, tables."""
