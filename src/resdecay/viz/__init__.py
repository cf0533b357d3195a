"""All matplotlib: PNG plots of schedules, curves and reconstructions (``plots``) and the paper's
figures (``figures``: t-SNE, PCA maps, rank/accuracy curves). Importing it selects the Agg backend."""
