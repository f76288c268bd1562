"""The XFlow MONAI Label app folder, as MONAI Label's sample apps are: serve it with upstream's own

    monailabel start_server --app apps/xflow --studies sample-data --host 127.0.0.1

MONAI Label loads this ``main.py`` and instantiates the one class in it whose direct base is
``MONAILabelApp``: :class:`~monailabel_xflow.app.xflow_app.XFlowApp`, the packaged app (tasks in
``monailabel_xflow/app/configs.py``, what upstream apps keep in ``lib/``), so this folder and
``xflow serve`` (which writes the same import into its workspace) serve one and the same app. Its
options are ``--conf`` keys (``models_file``, ``model_dir``, ``dicomweb_search_filter``,
``store_seg``): see this folder's README.md.

To change the app, subclass ``XFlowApp`` in the package rather than here: MONAI Label's loader
looks for a *direct* subclass of ``MONAILabelApp`` in this module and would keep serving
``XFlowApp`` itself.
"""

from monailabel_xflow.app.xflow_app import XFlowApp

__all__ = ["XFlowApp"]
