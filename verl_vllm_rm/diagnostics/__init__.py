"""Refit diagnostics: does the server score exactly like the trainer's model?"""
