"""Generation: one model's requests batched over a forward pass, sampled, constrained and streamed.

Nothing here loads a model or knows which engine runs it: a forward (transformers',
llama.cpp's or a stand-in) is handed to the `Scheduler`, which asks only what
`forward.Forward` says.
"""
