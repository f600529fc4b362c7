"""In the notebook: the Python API, magics, the ipywidgets panel and the server extension."""
