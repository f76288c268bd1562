"""F_seg, the promptable segmenter (SAM3's tracker): set the image once, prompt many times.

``sam3`` holds the predictor contract and the transformers backend, ``official`` the optional
``sam3``-package backend, ``checkpoint`` the official-checkpoint key mapping, ``configs`` tiny
random configurations for tests and demos, ``cache`` the image-embedding cache both backends share.
"""
