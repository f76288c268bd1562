"""MONAI Label tasks of the XFlow app (infer, revise, scoring, strategy, train, datastore)."""
