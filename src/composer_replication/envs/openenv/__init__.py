"""OpenEnv transport: serve our tool environments (``server``) and train on any OpenEnv tool
environment through one adapter (``adapter``)."""
