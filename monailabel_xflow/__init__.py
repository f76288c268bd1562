"""XFlow for MONAI Label.

``__version__`` is the package's one version: ``setup.cfg`` reads it (``attr:``), ``xflow --version``
prints it and the MONAI Label app reports it in ``/info``.
"""

__version__ = "0.2.0"
