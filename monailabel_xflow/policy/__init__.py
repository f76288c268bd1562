"""The policies that talk to F_seg: π_init (Stage 1) and π_rev (Stage 2).

``protocol`` is the text both policies read and write, ``vlm`` the Gemma 3 VLM policies,
``oracle`` the simulated user of XFlow App. A.3 (clicks from ground truth), ``configs`` tiny
random Gemma 3 VLMs and the offline tokenizer.
"""
