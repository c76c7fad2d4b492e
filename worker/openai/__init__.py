"""OpenAI's request and response shapes, mapped to Conveyor's jobs and events: one home for the HTTP
gateway (worker/gateway/) and the Batch API and `conveyor batch` (worker/batch/).

request.py (a chat or completions body -> a validated protocol.Job) ; response.py (a done event -> a
`chat.completion` / `text_completion` body) ; logprobs.py (token events' logprobs -> a choice's) ;
echo.py (a completions body's echo and prompt_logprobs).
"""
