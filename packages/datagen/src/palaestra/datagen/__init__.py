"""palaestra.datagen: HardGen + FunReason-MT.

Hard, verified, multi-turn tool-use data from executable API environments.
"""
