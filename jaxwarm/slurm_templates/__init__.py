"""The sbatch templates `jaxwarm render` fills in, shipped as package data so that an
installed jaxwarm (not only a checkout) can render them."""
