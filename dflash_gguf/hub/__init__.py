"""The model layer's Hub: repo ids and revisions (names.py), models named on the Hub resolved to files
(resolve.py) and the command-line parameter that takes them (model_param.py), the one guarded HTTP
client for all Hub traffic (client.py) and the Hub cache read as untrusted local state (cache.py)."""
