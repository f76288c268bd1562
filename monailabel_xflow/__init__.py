"""XFlow for MONAI Label."""
