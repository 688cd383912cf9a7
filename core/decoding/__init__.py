"""Decoding: plain and speculative loops, the drafter, the vocabulary bridge, verification, sampling."""
