"""The server's own routes: health (`health`), served models and plugins (`model_cards`), metrics
(`metrics`) and bulk jobs (`jobs`)."""
