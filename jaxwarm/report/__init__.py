"""Init reports read back and rendered: the headline, the tables, status, history, the plot."""
