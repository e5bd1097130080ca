"""Code that runs inside the image, on its own interpreter: stdlib only, nothing of the host side imported."""
