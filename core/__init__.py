"""What the agent and the aggregator share: the lease contract, durations, API access, errors, logging.

Nothing here imports aiohttp or the ``kubernetes`` package: the agent runs on
every node and stays small.
"""
