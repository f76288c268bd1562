"""One error tree: every error class of the package derives from ``XFlowError`` through a base
that fixes its HTTP status, and the app maps statuses by base class only."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import monailabel_xflow
from monailabel_xflow import errors
from monailabel_xflow.errors import (
    BadRequestError,
    InputError,
    NotFoundError,
    TooLargeError,
    UnavailableError,
    XFlowError,
    http_status,
)


def package_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a module of the package (``transforms`` included)."""
    found = {}
    for info in pkgutil.walk_packages(monailabel_xflow.__path__, "monailabel_xflow."):
        module = importlib.import_module(info.name)
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_every_error_class_of_the_package_is_in_the_tree():
    classes = package_exceptions()
    assert len(classes) >= 30  # the walk really reached the modules
    outside = sorted(f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, XFlowError))
    assert not outside, f"error classes outside the XFlowError tree: {outside}"


def test_every_error_class_has_a_documented_meaning():
    """Each class is an input error (4xx), an availability error (503) or, deliberately, neither."""
    plain = sorted(c.__qualname__ for c in package_exceptions() if http_status(c.__new__(c)) is None)
    # an unsupported MONAI Label: the app cannot run at all (it refuses to start), no answer's status
    assert plain == ["EvaluationError", "UnsupportedMonaiLabelError", "XFlowError"], plain


@pytest.mark.parametrize(
    "module, name, status",
    [
        ("monailabel_xflow.transforms.loading", "CXRLoadError", 400),
        ("monailabel_xflow.app.errors", "UnsafeIdError", 400),
        ("monailabel_xflow.app.errors", "ImageNotFoundError", 404),
        ("monailabel_xflow.app.errors", "RequestTooLargeError", 413),
        ("monailabel_xflow.app.errors", "RequestError", 422),
        ("monailabel_xflow.instructions", "InstructionError", 422),
        ("monailabel_xflow.geometry", "GeometryError", 422),
        ("monailabel_xflow.workflow.xflow", "WorkflowError", 422),
        ("monailabel_xflow.app.errors", "ModelsNotConfiguredError", 503),
        ("monailabel_xflow.workflow.model_config", "ModelConfigError", 503),
    ],
)
def test_the_app_answers_by_base_class(module, name, status):
    from monailabel_xflow.app.errors import status_of

    cls = getattr(importlib.import_module(module), name)
    assert status_of(cls.__new__(cls)) == status  # the status depends on the class alone


def test_a_new_error_class_gets_its_status_from_its_base_without_registration():
    from monailabel_xflow.app.errors import status_of

    class RenamedModuleError(InputError):
        """As if a module had been renamed: nothing refers to it by name."""

    class Gone(NotFoundError):
        pass

    assert status_of(RenamedModuleError("x")) == 422 and status_of(Gone("x")) == 404
    assert status_of(ValueError("a bare ValueError is a bug, not documented input")) is None
    assert status_of(XFlowError("a failure of the package itself")) is None


def test_the_bases_keep_the_builtin_types_callers_catch():
    assert issubclass(InputError, ValueError) and issubclass(UnavailableError, RuntimeError)
    assert issubclass(NotFoundError, LookupError)
    assert {BadRequestError, NotFoundError, TooLargeError} <= {
        c for c in errors.HTTP_STATUS if issubclass(c, InputError)
    }


def test_monai_labels_unknown_image_is_a_404():
    from monailabel.interfaces.exception import ImageNotFoundException

    from monailabel_xflow.app.errors import status_of

    assert status_of(ImageNotFoundException("no such image")) == 404
