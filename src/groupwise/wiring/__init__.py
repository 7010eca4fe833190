"""The run's options to its parts, in one place: the model and its device and precision
(:mod:`.model`), the reward functions and the scorer (:mod:`.rewards`), the rollout engine
with its tools or environment (:mod:`.rollout`), the task's rows (:mod:`.rows`), and all of
them together (:mod:`.assemble`) as one frozen run record (:mod:`.run`). This is the only
package that maps option names to components; the trainers and the command line take the parts
from here."""
