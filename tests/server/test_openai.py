"""The official openai client against `klein serve` (tiny model): images.generate and images.edit
unchanged (klein's seed/steps through extra_body), output formats, the job interface (SSE
progress and previews, cancel) and the API key."""
import serverlib

serverlib.require("openai")

import base64
import json
import os
import unittest
import urllib.request

import openai

from serverlib import Server, job_events, png_size, png_text, tiny_png


class OpenAIClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # The LoRA fixtures (tests/data/lora, beside the tiny model) as the folder requests name LoRAs in.
        cls.lora_dir = os.path.join(os.path.dirname(os.path.abspath(serverlib.TINY)), "lora")
        cls.srv = Server("--api-key", "test-key", "--lora-dir", cls.lora_dir)
        cls.client = openai.OpenAI(base_url=cls.srv.url + "/v1", api_key="test-key", max_retries=0, timeout=60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.srv.close()

    def test_generate(self):
        r = self.client.images.generate(model="tiny", prompt="a red fox", size="64x48", n=2,
                                        response_format="b64_json", extra_body={"seed": 11, "steps": 2})
        self.assertEqual(len(r.data), 2)
        for i, item in enumerate(r.data):
            png = base64.b64decode(item.b64_json)
            self.assertEqual(png_size(png), (64, 48))
            meta = png_text(png)
            # The same text chunks as `klein generate` writes.
            self.assertEqual(meta["prompt"], "a red fox")
            self.assertEqual(meta["seed"], str(11 + i))
            self.assertEqual(meta["steps"], "2")
            self.assertEqual(meta["size"], "64x48")
            self.assertEqual(meta["model"], "tiny")
            self.assertTrue(meta["software"].startswith("klein.cpp "))

    def test_same_seed_same_image(self):
        a = self.client.images.generate(prompt="x", size="32x32", extra_body={"seed": 5, "steps": 1})
        b = self.client.images.generate(prompt="x", size="32x32", extra_body={"seed": 5, "steps": 1})
        self.assertEqual(a.data[0].b64_json, b.data[0].b64_json)

    def test_edit(self):
        ref = tiny_png(80, 64)
        r = self.client.images.edit(image=("photo.png", ref, "image/png"), prompt="make it night",
                                    extra_body={"seed": 3, "steps": 2})
        png = base64.b64decode(r.data[0].b64_json)
        self.assertEqual(png_size(png), (80, 64), "an edit takes the reference's size by default")
        meta = png_text(png)
        self.assertEqual(meta["reference1"], "photo.png")
        self.assertEqual(meta["prompt"], "make it night")

    def test_inpaint_with_mask(self):
        # OpenAI's `mask` part: the first image is the inpainting source (white = repaint, as diffusers).
        r = self.client.images.edit(image=("photo.png", tiny_png(80, 64), "image/png"),
                                    mask=("mask.png", tiny_png(40, 32, 9), "image/png"), prompt="a hat",
                                    size="32x32", extra_body={"seed": 3, "steps": 2, "strength": 0.5})
        png = base64.b64decode(r.data[0].b64_json)
        self.assertEqual(png_size(png), (80, 64), "inpainting takes the source's size")
        meta = png_text(png)
        self.assertEqual((meta["inpainting source"], meta["mask"], meta["strength"]), ("photo.png", "mask.png", "0.5"))
        # A mask with an alpha channel (OpenAI marks the area to edit by transparency) is refused.
        rgba = bytearray(tiny_png(40, 32, 9))
        rgba[25] = 6  # IHDR colour type: RGBA (the pixel data no longer matches; refused before decoding)
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.images.edit(image=("photo.png", tiny_png(80, 64), "image/png"),
                                    mask=("mask.png", bytes(rgba), "image/png"), prompt="a hat")
        self.assertEqual(e.exception.body["param"], "mask")

    def test_edit_two_images(self):
        r = self.client.images.edit(image=[("a.png", tiny_png(64, 64, 1), "image/png"),
                                           ("b.png", tiny_png(64, 64, 2), "image/png")],
                                    prompt="combine", size="48x48", extra_body={"seed": 1, "steps": 1})
        meta = png_text(base64.b64decode(r.data[0].b64_json))
        self.assertEqual((meta["reference1"], meta["reference2"]), ("a.png", "b.png"))

    def test_stream_generate(self):
        # OpenAI's image streaming through the official client: partial images, then the image.
        stream = self.client.images.generate(model="tiny", prompt="a fox", size="64x64", stream=True, partial_images=2,
                                             extra_body={"seed": 21, "steps": 4})
        events = list(stream)
        self.assertEqual([e.type for e in events], ["image_generation.partial_image"] * 2 + ["image_generation.completed"])
        self.assertEqual([e.partial_image_index for e in events[:2]], [0, 1])
        for e in events:
            png = base64.b64decode(e.b64_json)
            self.assertEqual(png_size(png), (64, 64))
            self.assertEqual((e.size, e.output_format), ("64x64", "png"))
        # The streamed image is the one the plain endpoint gives for the same request.
        plain = self.client.images.generate(prompt="a fox", size="64x64", extra_body={"seed": 21, "steps": 4})
        self.assertEqual(events[-1].b64_json, plain.data[0].b64_json)
        self.assertEqual(png_text(base64.b64decode(events[-1].b64_json))["seed"], "21")

    def test_guidance_fields(self):
        # Accepted; the tiny model is distilled, so guidance is ignored and the image unchanged.
        a = self.client.images.generate(prompt="x", size="32x32", extra_body={"seed": 5, "steps": 1})
        b = self.client.images.generate(prompt="x", size="32x32", extra_body={
            "seed": 5, "steps": 1, "guidance_scale": 7.5, "negative_prompt": "blurry"})
        self.assertEqual(a.data[0].b64_json, b.data[0].b64_json)
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.images.generate(prompt="x", size="32x32", extra_body={"guidance_scale": 500})
        self.assertEqual(e.exception.body["param"], "guidance_scale")

    def test_lora_per_request(self):
        # The resident model with a request's LoRA, without it, and with it again: the LoRA changes
        # the image, and switching back gives the same bytes.
        def gen(**extra):
            return self.client.images.generate(prompt="x", size="32x32", extra_body={"seed": 3, "steps": 1, **extra})
        a = gen(lora="lora_diffusers.safetensors:0.5").data[0].b64_json
        b = gen().data[0].b64_json
        c = gen(lora=["lora_diffusers.safetensors:0.5"]).data[0].b64_json
        self.assertNotEqual(a, b)
        self.assertEqual(a, c)
        for bad in ("../lora_diffusers.safetensors", "a.safetensors:1e9", 5):
            with self.assertRaises(openai.BadRequestError) as e:
                gen(lora=bad)
            self.assertEqual(e.exception.body["param"], "lora")

    def test_stream_without_partials_and_with_n(self):
        events = list(self.client.images.generate(prompt="x", size="32x32", n=2, stream=True,
                                                  extra_body={"seed": 4, "steps": 2, "output_format": "jpeg"}))
        self.assertEqual([e.type for e in events], ["image_generation.completed"] * 2)
        self.assertTrue(all(base64.b64decode(e.b64_json).startswith(b"\xff\xd8\xff") for e in events))
        self.assertEqual(events[0].output_format, "jpeg")

    def test_stream_edit(self):
        events = list(self.client.images.edit(image=("photo.png", tiny_png(80, 64), "image/png"), prompt="night",
                                               stream=True, partial_images=1, extra_body={"seed": 3, "steps": 2}))
        self.assertEqual([e.type for e in events], ["image_edit.partial_image", "image_edit.completed"])
        self.assertEqual(png_size(base64.b64decode(events[-1].b64_json)), (80, 64))

    def test_stream_errors_are_raised(self):
        # A bad request is refused before the stream starts ...
        with self.assertRaises(openai.BadRequestError) as e:
            list(self.client.images.generate(prompt="x", size="33x32", stream=True))
        self.assertEqual(e.exception.body["param"], "size")
        # ... one the engine refuses while running ends the stream with an error event.
        with self.assertRaises(openai.APIError) as e:
            list(self.client.images.edit(image=("small.png", tiny_png(64, 48), "image/png"), prompt="x", stream=True))
        self.assertIn("small.png", str(e.exception))

    def test_output_formats(self):
        for fmt, magic in (("jpeg", b"\xff\xd8\xff"), ("webp", b"RIFF")):
            r = self.client.images.generate(prompt="x", size="32x32", extra_body={"steps": 1, "output_format": fmt})
            self.assertTrue(base64.b64decode(r.data[0].b64_json).startswith(magic), fmt)

    def test_url_is_a_400(self):
        with self.assertRaises(openai.BadRequestError) as e:
            self.client.images.generate(prompt="x", size="32x32", response_format="url")
        self.assertEqual(e.exception.body["code"], "unsupported_value")
        self.assertEqual(e.exception.body["param"], "response_format")

    def test_wrong_key_is_401(self):
        bad = openai.OpenAI(base_url=self.srv.url + "/v1", api_key="nope", max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.images.generate(prompt="x", size="32x32")
        bad.close()
        self.assertEqual(self.srv.request("GET", "/health")[0], 200, "/health needs no key")

    def test_models(self):
        ids = [m.id for m in self.client.models.list()]
        self.assertEqual(ids, ["tiny"])

    def _events(self, job_id):
        ctype, events = job_events(self.srv.url, job_id, headers={"Authorization": "Bearer test-key"})
        self.assertEqual(ctype, "text/event-stream")
        return events

    def test_job_events(self):
        auth = {"Authorization": "Bearer test-key"}
        st, body, _ = self.srv.request("POST", "/v1/jobs", {"prompt": "sse", "size": "32x32", "steps": 3, "seed": 9},
                                       headers=auth)
        self.assertEqual(st, 202, body)
        events = self._events(body["id"])
        names = [e[0] for e in events]
        self.assertEqual(names[-1], "done")
        steps = [d["done"] for n, d in events if n == "progress" and d["phase"] == "denoise"]
        self.assertEqual(steps[-1], 3)
        done = events[-1][1]
        self.assertEqual(png_text(base64.b64decode(done["data"][0]["b64_json"]))["seed"], "9")
        st, status, _ = self.srv.request("GET", "/v1/jobs/" + body["id"], headers=auth)
        self.assertEqual((st, status["status"]), (200, "succeeded"))

    def test_job_previews_and_cancel(self):
        auth = {"Authorization": "Bearer test-key"}
        st, body, _ = self.srv.request("POST", "/v1/jobs", {"prompt": "long", "size": "512x512", "steps": 100},
                                       headers=auth)
        self.assertEqual(st, 202)
        req = urllib.request.Request(f"{self.srv.url}/v1/jobs/{body['id']}/events", headers=auth)
        with urllib.request.urlopen(req, timeout=60) as r:
            for raw in r:
                line = raw.decode()
                if line.startswith("data: ") and '"mime"' in line:
                    preview = json.loads(line[6:])
                    break
        self.assertTrue(base64.b64decode(preview["b64_json"]).startswith(b"\xff\xd8\xff"), "previews are JPEG")
        st, status, _ = self.srv.request("DELETE", "/v1/jobs/" + body["id"], headers=auth)
        self.assertEqual((st, status["status"]), (200, "cancelled"))
        self.assertEqual(self.srv.request("GET", "/v1/jobs/job_nope", headers=auth)[0], 404)


if __name__ == "__main__":
    unittest.main(verbosity=2)
