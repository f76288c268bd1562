"""Training XFlow: data builders, the segmenter fine-tuning, SFT and GRPO of both policies.

Everything here runs at tiny scale on one CPU and scales out unchanged under
``accelerate launch`` (configs in ``configs/accelerate/``).
"""
