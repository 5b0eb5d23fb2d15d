"""The web page in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium):
load /, submit a prompt, wait for the image in the gallery, save a screenshot in the build
folder; then drop a reference image on the page and generate an edit. Skips (exit 77) only when
Chromium cannot start at all."""
import serverlib

serverlib.require("selenium")

import base64
import os
import sys
import unittest

from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from serverlib import ARTIFACTS, Server, tiny_png

SKIP = 77  # ctest SKIP_RETURN_CODE


def start_chromium(width, height):
    opts = webdriver.ChromeOptions()
    for path in ("/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if os.path.exists(path):
            opts.binary_location = path
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--window-size={width},{height}"):
        opts.add_argument(arg)
    driver_path = next((p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver") if os.path.exists(p)), None)
    return webdriver.Chrome(options=opts, service=Service(driver_path) if driver_path else None)


class Page(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = Server()
        cls.driver = start_chromium(1100, 800)
        os.makedirs(ARTIFACTS, exist_ok=True)

    @classmethod
    def tearDownClass(cls):
        cls.driver.quit()
        cls.srv.close()

    def fill(self, prompt, size=64, steps=3, seed=7):
        d = self.driver
        for field, value in (("prompt", prompt), ("width", size), ("height", size), ("steps", steps), ("seed", seed)):
            el = d.find_element(By.ID, field)
            el.clear()
            el.send_keys(str(value))

    # Generous waits: they end as soon as the page is ready, and one run timed out at 10 / 30 s
    # on a loaded 2-core VM (ctest -j2 beside a heavy test).
    def wait_results(self, n):
        WebDriverWait(self.driver, 120).until(
            lambda d: len(d.find_elements(By.CSS_SELECTOR, "#gallery .result img")) >= n
            or d.find_element(By.ID, "error").text)
        self.assertEqual(self.driver.find_element(By.ID, "error").text, "")

    def test_1_generate(self):
        d = self.driver
        d.get(self.srv.url + "/")
        WebDriverWait(d, 60).until(EC.text_to_be_present_in_element((By.ID, "status"), "ready"))
        self.fill("a lighthouse at dusk")
        d.find_element(By.ID, "generate").click()
        self.wait_results(1)
        cap = d.find_element(By.CSS_SELECTOR, "#gallery .result figcaption").text
        self.assertIn("64x64", cap)
        self.assertIn("seed 7", cap)
        copy = d.find_element(By.CSS_SELECTOR, "#gallery .result .actions button")
        self.assertIn("klein generate --model 'tiny' --prompt 'a lighthouse at dusk' -W 64 -H 64 --steps 3 --seed 7",
                      copy.get_attribute("title"))
        link = d.find_element(By.CSS_SELECTOR, "#gallery .result a")
        self.assertTrue(link.get_attribute("href").startswith("data:image/png;base64,"))
        self.assertEqual(link.get_attribute("download"), "klein-7.png")
        # Keyboard: Ctrl+Enter in the prompt submits.
        from selenium.webdriver.common.keys import Keys
        d.find_element(By.ID, "randomise").click()
        d.find_element(By.ID, "prompt").send_keys(Keys.CONTROL, Keys.ENTER)
        self.wait_results(2)
        d.save_screenshot(os.path.join(ARTIFACTS, "server_page.png"))

    def test_2_drop_reference(self):
        d = self.driver
        d.get(self.srv.url + "/")
        self.fill("make it night", size=48, steps=2, seed=3)
        # Guidance fields go into the form (multipart) request and the copied command line.
        d.find_element(By.ID, "guidance").send_keys("7.5")
        d.find_element(By.ID, "negative").send_keys("dark")
        # A drop event with a real File in its DataTransfer, as a drag from the desktop delivers.
        d.execute_script("""
            const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], 'ref.png', {type: 'image/png'}));
            const drop = document.getElementById('drop');
            drop.dispatchEvent(new DragEvent('dragover', {dataTransfer: dt, bubbles: true, cancelable: true}));
            drop.dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
        """, base64.b64encode(tiny_png(96, 64)).decode())
        self.assertEqual(len(d.find_elements(By.CSS_SELECTOR, "#refs img")), 1)
        d.find_element(By.ID, "generate").click()
        self.wait_results(1)
        cap = d.find_element(By.CSS_SELECTOR, "#gallery .result figcaption").text
        self.assertIn("1 reference", cap)
        title = d.find_element(By.CSS_SELECTOR, "#gallery .result .actions button").get_attribute("title")
        self.assertIn("--ref 'ref.png'", title)
        self.assertIn(" -g 7.5 --negative-prompt 'dark'", title)
        d.save_screenshot(os.path.join(ARTIFACTS, "server_page_edit.png"))

    def test_3_phone_width(self):
        d = self.driver
        d.set_window_size(390, 844)
        d.get(self.srv.url + "/")
        width = d.execute_script("return document.documentElement.scrollWidth")
        self.assertLessEqual(width, 390, "no horizontal scrolling at phone width")


if __name__ == "__main__":
    try:
        start_chromium(200, 200).quit()
    except WebDriverException as e:
        print(f"SKIP: headless Chromium cannot start here ({str(e).splitlines()[0]})")
        sys.exit(SKIP)
    unittest.main(verbosity=2)
