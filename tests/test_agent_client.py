"""A real agent framework against infer serve, end to end: the OpenAI Agents SDK (`openai-agents`
from PyPI) runs an agent with one function tool on the embedded model, over the Responses API
(the SDK's default) and over Chat Completions. The agent loop is the SDK's own: it sends the
tools, reads the model's call, runs the Python function, sends its output back and takes the
model's final message, as it would against OpenAI."""

from __future__ import annotations

import agents
import pytest
from serve_helpers import Server


@pytest.fixture
def server(qwen3_server: Server) -> Server:
    return qwen3_server


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_openai_agents_sdk_agent_calls_its_tool_and_answers(server: Server, api: str) -> None:
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return f"Sunny, 24 C in {city}."

    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    model_class = agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    settings = agents.ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                    max_tokens=400)
    agent = agents.Agent(name="Weather", instructions="Answer with the weather tool.", tools=[get_weather],
                         model=model_class(model="smollm2", openai_client=client), model_settings=settings)
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    kinds = [type(item).__name__ for item in result.new_items]
    assert cities == ["Paris"], kinds
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], kinds
    assert isinstance(result.final_output, str) and result.final_output.strip(), result.final_output
