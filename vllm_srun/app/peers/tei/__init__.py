"""text-embeddings-inference's routes, adapters onto the surfaces: embed (/embed, /embed_all,
/embed_sparse, /similarity), predict, rerank, the model's facts (/info, /tokenize, /decode)
and its model and health routes at the root, every error in TEI's body (`errors`).
"""
